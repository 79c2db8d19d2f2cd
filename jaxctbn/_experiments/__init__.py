"""The paper's experiments on the host: configuration, runs, result files, reports, and the
real-data pool experiment."""
