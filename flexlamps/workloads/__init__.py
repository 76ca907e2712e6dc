"""Augmented-request workloads: the INFERCEPT trace and its replay (`trace`), and the token ids
the engine feeds for each request and each call's reply (`tokenized`). No torch."""
