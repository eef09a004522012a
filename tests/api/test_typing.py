"""The types users get, checked by mypy --strict: ``@batch`` keeps the item and result types, and the constructor's
keywords are typed (a misspelt one is an error)."""

from __future__ import annotations

from pathlib import Path

from mypy import api as mypy_api

CHECKED = Path(__file__).with_name("typing_check_decorator.py")
CONSTRUCTOR = Path(__file__).with_name("typing_check_constructor.py")


def _mypy(path: Path) -> tuple[str, int]:
    stdout, stderr, status = mypy_api.run(["--strict", "--no-incremental", "--cache-dir=/dev/null", str(path)])
    return stdout + stderr, status


def test_the_decorator_keeps_the_types() -> None:
    output, status = _mypy(CHECKED)
    assert status == 0, output


def test_a_misspelt_or_mistyped_keyword_is_a_type_error() -> None:
    output, status = _mypy(CONSTRUCTOR)
    assert status == 0, output  # every error expected is there (its ignore is used), and no other


def test_the_constructor_check_can_fail(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        CONSTRUCTOR.read_text().replace(
            "Doubler(max_batch_szie=64)  # type: ignore[call-arg]", "Doubler(max_batch_szie=64)"
        )
    )
    output, status = _mypy(wrong)
    assert status == 1 and 'Unexpected keyword argument "max_batch_szie"' in output


def test_the_check_can_fail(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        CHECKED.read_text().replace(
            "assert_type(embed, BatchedFunction[str, list[float]])",
            "assert_type(embed, BatchedFunction[int, list[float]])",
        )
    )
    stdout, _, status = mypy_api.run(["--strict", "--no-incremental", "--cache-dir=/dev/null", str(wrong)])
    assert status == 1 and "assert-type" in stdout
