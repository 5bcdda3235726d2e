"""``autoalloc bench``: the A/B runner on a synthetic dynamic-shape ASR workload.

``schedule`` (Lhotse-like duration-bucketed batches), ``model`` (a Conformer-style CTC
encoder), ``workload`` (the runnable training loop: ``python -m autoalloc.bench.workload``),
``command`` (the arms, the calibration of the memory cap, the report). Nothing here imports
torch at module level; the workload's processes do.
"""
