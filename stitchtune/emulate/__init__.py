"""The numpy SIMT emulator of the kernel IR (lockstep threads, shared memory, barriers, faults)."""
