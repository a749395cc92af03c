"""Batches and ubatches, KV cache, recorded graphs and their replay, sampling."""
