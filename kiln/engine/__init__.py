"""Running schedules: compiling kernels into runners, executing them, and the JIT."""
