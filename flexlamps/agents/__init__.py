"""Agents whose tools really run: a request generates until it calls a tool, pauses while the
tool runs (sandboxed, in a thread) and resumes with the result as a new turn, on the augmented
engine under any policy. Workloads: Self-Debugging (HumanEval), program-aided GSM8K, and any
module of tool functions called with the Hermes `<tool_call>` syntax."""
