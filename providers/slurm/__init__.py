"""The Slurm provider (issue 33), being built: a cluster reached over SSH through its login host,
running the cluster's own commands. So far: `login` (a command on the login host, its failures
as one clear error each), `cluster` (partitions, GPUs free and in all, Slurm's start estimate)
and `jobs` (one gang allocation per attempt: submit, state, cancel, find). Not registered as a
provider yet."""
