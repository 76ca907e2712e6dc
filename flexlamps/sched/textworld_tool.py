"""A TextWorld game as a live tool: the virtual-environment augmentation (ALFWorld's kind).

Each call is one `env.step(command)`; the reply is the game's feedback text, appended to the
request's context. TextWorld generates and plays games offline (`pip install textworld`, the
`textworld` extra); a step takes about a millisecond, so these are short, frequent calls.

    game = TextWorldGame(TextWorldGame.make("/tmp/games", seed=1))
    detector = ToolDetector(tools={"calculator": calculator, "textworld": game},
                            patterns={**ToolDetector.DEFAULT_PATTERNS, "textworld": TextWorldGame.PATTERNS})
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def _textworld():
    try:
        import textworld
    except ImportError as e:
        raise RuntimeError("the TextWorld tool needs textworld: pip install 'flexlamps[textworld]'") from e
    return textworld


class TextWorldGame:
    # `[Act(open chest)]` (Toolformer style) or `<<act: open chest>>`
    PATTERNS = (r"\[Act\((?P<arg>[^\[\]]*?)\)\]", r"<<act:(?P<arg>[^<>]*?)>>")

    def __init__(self, game_file: str):
        if not os.path.exists(game_file):
            raise FileNotFoundError(f"TextWorld game {game_file} not found; create one with TextWorldGame.make")
        self.env = _textworld().start(game_file)
        self.intro = self.env.reset().feedback
        self.score, self.done, self.steps = 0, False, 0

    def __call__(self, command: str) -> str:
        if self.done:
            return "The game is over."
        state, self.score, self.done = self.env.step(command)
        self.steps += 1
        return state.feedback.strip()

    def close(self) -> None:
        self.env.close()

    @staticmethod
    def make(out_dir: str, seed: int, challenge: str = "tw-simple") -> str:
        """Generate a game offline with `tw-make`; returns the path of the .z8 file."""
        _textworld()
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{challenge}-{seed}.z8")
        if os.path.exists(path):
            return path
        tw_make = shutil.which("tw-make") or os.path.join(os.path.dirname(sys.executable), "tw-make")
        cmd = [tw_make, challenge, "--seed", str(seed), "--output", path, "-f", "--silent"]
        if challenge == "tw-simple":
            cmd += ["--rewards", "dense", "--goal", "detailed"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"tw-make failed for seed {seed}: {done.stderr.strip()[-400:]}")
        return path
