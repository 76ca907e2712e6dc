"""flexlamps' C kernels, all in this folder, and their one loader (`loader`).

Where torch has no kernel as fast for our layouts: decode's 4-bit / 5-bit / int8 products in
place (`tile_gemv`), prompts on int8 codes (`int8_gemm`), attention over our cache (`attention`),
RMSNorm and SwiGLU in one pass (`elementwise`). Each is compiled on first use into the cache
folder, checked against torch before use, and replaced by torch's kernels where it cannot run.
Imports quant (the weight layouts) and flexlamps.cache_folder; nothing of models or the engine.
"""
