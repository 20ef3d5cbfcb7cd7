"""Stand-ins the tests and benchmarks run in place of real parts: an engine with a fixed answer time, a proxy that
holds or slows a real engine's answers."""
