"""The kernel IR: a per-thread SIMT program that the CUDA renderer and the emulator both consume."""
