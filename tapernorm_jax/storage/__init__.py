"""Storage: run, study and export directories, local or at a URL; atomic writes, retried copies, checksums, the
directory lock, and what a checkpoint that cannot be read back looks like."""
