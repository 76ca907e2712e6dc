"""The batch face: generate and score lists of prompts through an executor."""
