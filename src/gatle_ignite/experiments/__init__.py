"""Many runs at once: finding them under a folder, reading what each became and how it was
made, and what sets them apart. Read-only: nothing here writes into a run directory.
"""
