"""The run directory: the only code that knows what ``save_dir`` holds and how it is written.

``layout`` names its files, ``manifest`` is its ``run.json``, ``lock`` keeps it to one process,
``identity`` says which config changes change the run, ``saving`` and ``loading`` write and read
checkpoints, ``exact_resume`` holds the data position and random state, and ``directory`` puts
them together for the trainer.
"""
