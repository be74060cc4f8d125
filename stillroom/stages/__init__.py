"""One module per ``rules/<name>.smk``, holding the stage functions its rules call through the CLI
(``stillroom <stage>``): each checks its typed params, reads its inputs, calls the library, writes
its outputs and returns its metrics for the provenance sidecar."""
