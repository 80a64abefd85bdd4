"""The cost model: pure functions from an op and a device to seconds."""
