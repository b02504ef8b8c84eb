"""Files stamped with an identity (dlcrepro/step/stamped.py): what the checkpoint sidecar, the shared
rollouts and θ_0's evaluation share."""

import pytest

from dlcrepro.step import stamped
from dlcrepro.core.config import ConfigError
from dlcrepro.core.util import DamagedFileError

IDENT = {"format": 1, "seed": 0, "train": {"steps": 6, "lr": 0.3}, "range": (1, 9)}


@pytest.mark.parametrize("as_json", [True, False])
def test_a_stamped_file_loads_for_its_own_identity_and_names_what_differs_for_another(tmp_path, as_json):
    path = tmp_path / ("f.json" if as_json else "f.pt")
    stamped.write(path, IDENT, "body", {"a": 1.5}, as_json=as_json)
    got, body = stamped.load(path, IDENT, "body", "things", "things file", as_json=as_json)
    assert body == {"a": 1.5} and got["seed"] == 0  # a tuple written is the list read: the same identity
    other = {**IDENT, "seed": 1, "train": {"steps": 2, "lr": 0.3}}
    with pytest.raises(ConfigError, match=r"holds things of another run: seed, train differ \(seed: 0 there, 1 here; "
                                          r"train.steps: 6 there, 2 here\); delete it and rerun its rule"):
        stamped.load(path, other, "body", "things", "things file", as_json=as_json)
    assert stamped.load(path, {**IDENT, "seed": 1}, "body", "things", "things file", as_json=as_json,
                        skip=("seed",))[1] == {"a": 1.5}


def test_a_damaged_stamped_file_is_named(tmp_path):
    path = tmp_path / "f.json"
    path.write_text('{"identity": ')
    with pytest.raises(DamagedFileError, match=r"f.json: not a readable things file \(JSONDecodeError"):
        stamped.load(path, IDENT, "body", "things", "things file", as_json=True)
    with pytest.raises(FileNotFoundError):
        stamped.load(tmp_path / "none.json", IDENT, "body", "things", "things file", as_json=True)


def test_differences_name_dotted_keys_with_both_values():
    assert stamped.differences({"config": {"train": {"lr": 0.15}}}, {"config": {"train": {"lr": 0.3}}}) == [
        "config.train.lr: 0.15 there, 0.3 here"]
    assert stamped.differing_keys({"a": (1, 2), "b": 1}, {"a": [1, 2], "b": 2}) == ["b"]


def test_every_config_key_is_either_part_of_a_cells_numbers_or_a_workflow_key():
    import dataclasses

    from dlcrepro.core.config import Config

    keys = {f.name for f in dataclasses.fields(Config)}
    assert keys == {*stamped.NUMBER_SECTIONS, "models", *stamped.WORKFLOW_KEYS}
    assert not set(stamped.NUMBER_SECTIONS) & set(stamped.WORKFLOW_KEYS)


def test_a_cells_identity_is_its_numbers_not_where_it_is_watched_written_or_scheduled(smoke_cfg):
    import dataclasses as dc

    from dlcrepro.core.config import ModelConfig

    meta = {"model": "tiny", "sampler": "stale", "correction": "pg", "seed": 0, "model_dir": "m"}
    ident = lambda cfg, m=meta: stamped.cell_identity(stamped.run_record(m, cfg))  # noqa: E731
    here = ident(smoke_cfg)
    tiny = smoke_cfg.models["tiny"]
    aside = [
        dc.replace(smoke_cfg, tracking=dc.replace(smoke_cfg.tracking, backends=["tensorboard"], project="p")),
        dc.replace(smoke_cfg, results_dir="elsewhere", artifacts="a", name="n", python="py", fork_server=False),
        dc.replace(smoke_cfg, resources={"gpu": 1, "runtime": 600}, grid=dc.replace(smoke_cfg.grid, seeds=[7])),
        dc.replace(smoke_cfg, train=dc.replace(smoke_cfg.train, ckpt_every=1)),
        dc.replace(smoke_cfg, models={"tiny": dc.replace(tiny, resources={"gpu": 1})}),
    ]
    for cfg in aside:
        assert stamped.mismatch(ident(cfg), here) == []
    lr = dc.replace(smoke_cfg, train=dc.replace(smoke_cfg.train, lr=0.15))
    assert stamped.mismatch(ident(lr), here) == ["config.train.lr: 0.15 there, 0.3 here"]
    # a model's own train overrides are the train section it runs with
    per_model = dc.replace(smoke_cfg, models={"tiny": dc.replace(tiny, train={"lr": 0.15})})
    assert stamped.mismatch(ident(per_model), ident(lr)) == []
    arch = dc.replace(smoke_cfg, models={"tiny": ModelConfig(**{**dc.asdict(tiny), "arch": {**tiny.arch, "head_dim": 16}})})
    assert stamped.mismatch(ident(arch), here) == ["config.model.arch.head_dim: 16 there, 32 here"]
    assert stamped.mismatch(ident(smoke_cfg, {**meta, "seed": 1}), here) == ["cell.seed: 1 there, 0 here"]
    assert stamped.cell_identity({"cell": meta}) is None  # a record without its config is no run's
