"""What runs where: the workflow's plan (every rule's paths and params, from the typed experiment),
the jobs' shapes on a cluster, the cost estimate and the SLURM plan."""
