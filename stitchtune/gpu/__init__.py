"""The GPU side: rendering the IR to CUDA C, the nvcc build and cache, the launch path, and the runners (emulate, fake, GPU worker)."""
