"""A small built-in scenario for demos and smoke tests: well-known facts.

Short questions whose answers are one or two words, so even a 135M model gets some right and a
run finishes in seconds on a CPU. Two train instances supply in-context examples.
"""

from flexlamps.evals.instances import CORRECT_TAG, TRAIN_SPLIT, Instance, Reference, Scenario

_FACTS = [
    # (question, answer, split)
    ("What is the capital of France?", "Paris", TRAIN_SPLIT),
    ("How many days are there in a week?", "Seven", TRAIN_SPLIT),
    ("What is the capital of Italy?", "Rome", "test"),
    ("What color is the sky on a clear day?", "Blue", "test"),
    ("How many legs does a spider have?", "Eight", "test"),
    ("What is the largest planet in the solar system?", "Jupiter", "test"),
    ("What is the chemical symbol for water?", "H2O", "test"),
    ("What is the capital of Japan?", "Tokyo", "test"),
    ("How many continents are there on Earth?", "Seven", "test"),
    ("What is the opposite of hot?", "Cold", "test"),
]


def demo_scenario() -> Scenario:
    insts = [Instance(q, [Reference(a, [CORRECT_TAG])], split) for q, a, split in _FACTS]
    return Scenario("demo", "Eight short general-knowledge questions (built into flexlamps).",
                    ["question answering", "demo"], insts)
