"""Where a training run's time goes, and the profiler switch.

``epochs`` keeps each epoch's clocks and logs its ``perf/`` record; ``stopwatch`` sums the
time spent inside blocks (checkpoint writes, evaluations); ``flops`` counts one training step's
FLOPs once; ``devices`` knows GPUs' peak FLOP/s and reads peak memory; ``profiler`` runs
``torch.profiler`` over a few steps and writes a trace.
"""
