"""The KV cache: fixed-size blocks with ref counts, an LRU and a content index (block_pool), each sequence's block table
and copy-on-write (block_manager), the preallocated K/V tensors (cache), and the accounting read off them (stats)."""
