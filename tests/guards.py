"""Shared skip guards: tests that need the shipped zoo weights say so in one way."""
import pytest

import vgen


def needs_zoo(*names: str):
    """Skip unless every named zoo pipeline (default: the three shipped generators) is installed."""
    names = names or ("photos-gpt", "photos-nar", "photos-var")
    missing = [n for n in names if n not in vgen.list_models()]
    return pytest.mark.skipif(bool(missing), reason=f"zoo weights not installed: {', '.join(missing)}")


def cli_refusal(args, capsys) -> tuple[int, str]:
    """Run the `vgen` command in process on ``args`` that it must refuse: (exit code, its one stderr line); fails
    on a traceback or a message of more than one line."""
    from vgen.cli import main
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return e.value.code, err


def interruptible():
    """``preexec_fn`` for a child process a test interrupts with SIGINT: Ctrl-C's default action, whatever the test
    run inherited (a shell's background job, e.g. `nohup bash .ci/run &`, ignores SIGINT, and its children would too;
    Python keeps an ignored SIGINT ignored)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
