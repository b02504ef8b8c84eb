"""The cell and the study: a cell's directory from its first file to its summary (celldir), what a
study computes once for many cells (warmstart, initial_eval, rollouts), the rehearsal, the
sequential design's decisions (decide), the batch-size scan and the sampler probe. Reads `step`,
`cluster` and `report`."""
