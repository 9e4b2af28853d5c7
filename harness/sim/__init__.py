"""The SIMULATED engine (DESIGN §9): a vLLM-like scheduler and a calibrated roofline cost model, served over the
OpenAI API in real time (`serve-sim`) or run in virtual time over a trace (`simulate`). No GPU needed."""
