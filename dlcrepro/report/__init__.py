"""From finished runs to the paper's tables, figures and findings: aggregates (analysis), intervals,
the sequential design, the paper's numbers and how every number prints (formats), the outputs' one
list, publishing and the reproduction report. Imports only `core`: it reads what runs wrote, never how
they ran."""
