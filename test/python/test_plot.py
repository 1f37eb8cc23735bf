"""`python3 -m refpool.plot` on a log written by a real run of refpool (REFPOOL_CONF=log:PATH)."""
import pytest

from conftest import run_module, run_python

pytest.importorskip("matplotlib")
import matplotlib.image  # noqa: E402
from refpool.alloc_log import LogFormatError, live_bytes, read_log, summary  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Three steps; in each, 1000, 3000 and 6000 bytes live at once, then 500 after they are released.
RUN = """
    import refpool, sys
    backend = refpool.Backend.new_host()
    cache = refpool.Cache(from_environment=False)
    recorder = refpool.StatsRecorder(cache)
    for step in range(3):
        with cache.scope():
            buffers = [refpool.malloc(backend, (n,), 1) for n in (1000, 3000, 6000)]
            for b in buffers:
                b.release()
            refpool.malloc(backend, (500,), 1).release()
        recorder.sample(label=f"step {step}")
    recorder.write(sys.argv[-1] if len(sys.argv) > 1 else "stats.json")
"""


@pytest.fixture
def real_log(tmp_path):
    log = tmp_path / "alloc.csv"
    run_python(RUN.replace('"stats.json"', repr(str(tmp_path / "stats.json"))),
               env={"REFPOOL_CONF": f"log:{log}"})
    return log, tmp_path / "stats.json"


def test_the_log_of_a_real_run(real_log):
    log, _ = real_log
    events = read_log(log)
    figures = summary(events)
    assert (figures["allocations"], figures["frees"]) == (12, 12)
    assert figures["peak_live_bytes"] == 10000
    assert figures["live_bytes_at_end"] == 0
    assert figures["requested_bytes"] == 3 * 10500
    assert max(live_bytes(events)[:4]) == 10000 and live_bytes(events)[6] == 500
    assert figures["threads"] == 1


def test_plot_command_writes_a_png(real_log, tmp_path):
    log, stats = real_log
    out = tmp_path / "memory.png"
    result = run_module(["refpool.plot", str(log), str(out), "--stats", str(stats), "--title", "test run"])
    assert result.returncode == 0, result.stderr
    assert "12 requests, peak live 10,000 B" in result.stdout
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(str(out))
    height, width = image.shape[:2]
    assert width >= 800 and height >= 500


def test_plot_without_stats(real_log, tmp_path):
    log, _ = real_log
    out = tmp_path / "plain.png"
    result = run_module(["refpool.plot", str(log), str(out)])
    assert result.returncode == 0, result.stderr
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_a_file_that_is_not_a_log(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,2.0,allocate,0x10,64,0x0\n1,2.1,resize,0x10,64,0x0\n")
    with pytest.raises(LogFormatError, match=r"bad.csv:3"):
        read_log(bad)
    result = run_module(["refpool.plot", str(bad), str(tmp_path / "x.png")])
    assert result.returncode == 1 and "bad.csv:3" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_live_bytes_per_stream(tmp_path):
    log = tmp_path / "streams.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "7,10.000001,allocate,0x1000,100,0x0\n"
                   "8,10.000002,allocate,0x2000,300,0x55d0\n"
                   "7,10.000003,free,0x1000,100,0x0\n"
                   "8,10.000004,allocate,0x3000,50,0x55d0\n")
    events = read_log(log)
    assert live_bytes(events) == [100, 400, 300, 350]
    assert live_bytes(events, stream=0x55D0) == [0, 300, 300, 350]
    figures = summary(events)
    assert (figures["threads"], figures["streams"], figures["live_bytes_at_end"]) == (2, 2, 350)
    assert abs(figures["seconds"] - 3e-6) < 1e-9
    out = tmp_path / "streams.png"
    assert run_module(["refpool.plot", str(log), str(out)]).returncode == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)
