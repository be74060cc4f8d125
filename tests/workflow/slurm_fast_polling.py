"""`snakemake` whose SLURM executor checks its jobs' states every `--seconds-between-status-checks`,
for the SLURM tests. The plugin adds 10 s to the interval after each check in which no job ended (up
to 180 s): right for a real cluster's accounting database, while on the test cluster a 6 s job was
seen 8 s after it ended and a 16 s one 20 s after, most of the test run's time. Nothing else of the
plugin changes: jobs are submitted, placed and accounted by SLURM as the profile says."""

import sys

import snakemake_executor_plugin_slurm as slurm
from snakemake.cli import main

slurm.Executor.next_seconds_between_status_checks = property(
    lambda self: self.workflow.remote_execution_settings.seconds_between_status_checks,
    lambda self, value: None,  # the plugin's back-off, ignored
)

if __name__ == "__main__":
    sys.exit(main())
