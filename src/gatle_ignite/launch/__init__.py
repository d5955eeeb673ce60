"""Processes: which ones run a config, and how their ends are supervised.

``launcher`` runs one config here (joining a world torchrun or srun made, or spawning this
node's ranks) or several as child processes; ``world`` resolves the topology and rendezvous;
``task`` is what every rank runs; ``ranks`` supervises spawned ranks and reports how they ended.
"""
