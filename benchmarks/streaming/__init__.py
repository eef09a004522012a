"""The streaming benchmark: token streaming batched continuously, in static batches, and unbatched."""
