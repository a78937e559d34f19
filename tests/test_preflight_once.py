"""A run is preflighted once, whichever way it starts: the command line's preflight
(before any flow run, so a refusal is one line) is taken over by the flow run it starts,
which checks again only for another run or a second flow run."""

from ensemble_core import runs
from ensemble_core.config import load_config
from tasks import cluster


def test_the_flow_takes_over_the_command_lines_preflight_once(monkeypatch, tmp_path, tfds_dir):
    calls = []
    real = runs.preflight

    def counting(cfg, output_dir, run_name):
        calls.append(run_name)
        return real(cfg, output_dir, run_name)

    monkeypatch.setattr(runs, "preflight", counting)
    cfg = load_config(None, [f"data.data_dir={tfds_dir}"])
    out = str(tmp_path / "runs")
    before = cluster.preflight_before_flow(cfg, out, "a")
    assert calls == ["a"]
    assert cluster.preflight(cfg, out, "a") == before and calls == ["a"]  # the flow run's: taken over
    cluster.preflight(cfg, out, "a")  # a second flow run of the same run: checked again
    assert calls == ["a", "a"]
    cluster.preflight_before_flow(cfg, out, "a")
    cluster.preflight(cfg, out, "b")  # another run: checked, and the remembered one forgotten
    cluster.preflight(cfg, out, "a")
    cluster.preflight_before_flow(cfg, out, "a")
    other = load_config(None, [f"data.data_dir={tfds_dir}", "ensemble.size=2"])
    cluster.preflight(other, out, "a")  # another config: checked
    assert calls == ["a", "a", "a", "b", "a", "a", "a"]
