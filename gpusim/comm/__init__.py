"""Communication cost model: where a group of ranks sits, and what its collectives cost."""
