import pytest

from flexlamps.sched.tools import ToolDetector, calculator

textworld = pytest.importorskip("textworld", reason="textworld not installed (the optional [textworld] extra)")

from flexlamps.sched.textworld_tool import TextWorldGame  # noqa: E402


def test_textworld_game_as_a_tool(tmp_path):
    game = TextWorldGame(TextWorldGame.make(str(tmp_path), seed=1))
    detector = ToolDetector(tools={"calculator": calculator, "textworld": game},
                            patterns={**ToolDetector.DEFAULT_PATTERNS, "textworld": TextWorldGame.PATTERNS})
    call = detector.find("I should look around. [Act(look)]")
    assert call.tool == "textworld"
    reply = detector.run(call)
    assert "=-" in reply and game.steps == 1  # a room header like "-= Bedroom =-"
    assert detector.run(detector.find("<<calc: 1+1>>")) == "2"
    game.close()
