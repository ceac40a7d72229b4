"""What reaches the console and what only the run's log file (unitrain.host.console)."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from unitrain.host.console import captured_stdout, logged_to_file, printed_to_log_file, to_log_file


@pytest.fixture
def log_file(tmp_path):
    handler = logging.FileHandler(tmp_path / "unitrain.log")
    root = logging.getLogger()
    root.addHandler(handler)
    yield tmp_path / "unitrain.log"
    root.removeHandler(handler)
    handler.close()


def test_detail_goes_to_the_log_file_only(log_file, capsys):
    to_log_file("a table")
    assert "a table" in log_file.read_text() and "a table" not in capsys.readouterr().err


def test_lines_printed_with_a_quiet_prefix_go_to_the_log_and_the_rest_to_stderr(log_file, capsys):
    with printed_to_log_file(("Sampling stage",)):
        print("Sampling stage |  | 0/2\rSampling stage |##| 2/2", file=sys.stderr)
        print("a real error", file=sys.stderr)
        kept = sys.stderr  # a handler a library makes meanwhile keeps this stream
    kept.write("later\n")
    err = capsys.readouterr().err
    assert "a real error" in err and "later" in err and "Sampling" not in err
    assert "Sampling stage |##| 2/2" in log_file.read_text() and "0/2" not in log_file.read_text()


def test_a_librarys_own_logger_goes_to_the_log_file_meanwhile(log_file, capsys):
    library = logging.getLogger("some.library")
    own = logging.StreamHandler(sys.stderr)
    library.addHandler(own)
    try:
        with logged_to_file(("some.library",)):
            library.warning("deprecated way to load")
        library.warning("after")
    finally:
        library.removeHandler(own)
    err = capsys.readouterr().err
    assert "some.library: deprecated way to load" in log_file.read_text()
    assert "deprecated" not in err and "after" in err


@pytest.mark.parametrize("pass_on", [False, True])
def test_what_a_library_prints_on_descriptor_1_is_read_while_and_after_it_prints(pass_on, capfd):
    """As Fleet's client and paddle2onnx print from C++: written to file descriptor 1 itself,
    read while the block runs without losing what follows, and passed on only when asked."""
    with captured_stdout(pass_on=pass_on) as printed:
        os.write(1, b"table id: ")
        assert printed() == "table id: "
        os.write(1, b"0, feasign size: 7\n")
    assert printed() == "table id: 0, feasign size: 7\n"
    assert capfd.readouterr().out == ("table id: 0, feasign size: 7\n" if pass_on else "")
