"""CPU kernels for the routed experts of host-resident MoE layers (numba, compiled for the CPU it
runs on): the expert FFN reads the GGUF expert tensors where they lie in host memory, with the
activations quantised to q8 blocks as llama.cpp's CPU backend does. Nothing here touches Vulkan."""
