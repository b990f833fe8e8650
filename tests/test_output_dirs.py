"""Output directories: every job claims its own, even when many ask for one name at once."""

from concurrent.futures import ProcessPoolExecutor

from omegaconf import OmegaConf

from posbench.system.output_dirs import claim_unique_dir, register_output_dir_resolvers, unclaimed


def test_a_free_name_is_created_as_requested(tmp_path):
    path = claim_unique_dir(str(tmp_path / "runs" / "12-00-00_rope"))
    assert path == str(tmp_path / "runs" / "12-00-00_rope")
    assert (tmp_path / "runs" / "12-00-00_rope").is_dir()


def test_a_taken_name_gets_the_next_free_suffix(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run_2").mkdir()
    assert claim_unique_dir(str(tmp_path / "run")) == str(tmp_path / "run_3")
    assert claim_unique_dir(str(tmp_path / "run")) == str(tmp_path / "run_4")


def test_processes_claiming_one_name_at_once_all_get_distinct_directories(tmp_path):
    with ProcessPoolExecutor(max_workers=8) as pool:
        paths = list(pool.map(claim_unique_dir, [str(tmp_path / "same")] * 16))
    assert len(set(paths)) == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["same", *(f"same_{n}" for n in range(2, 17))]
    )


def test_the_resolver_claims_once_per_config_however_often_it_is_read(tmp_path):
    register_output_dir_resolvers()
    cfg = OmegaConf.create({"dir": "${unique_dir:" + str(tmp_path / "run") + "}"})
    assert cfg.dir == cfg.dir == str(tmp_path / "run")
    other = OmegaConf.create({"dir": "${unique_dir:" + str(tmp_path / "run") + "}"})
    assert other.dir == str(tmp_path / "run_2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run_2"]


def test_inside_unclaimed_the_resolver_names_the_request_and_creates_nothing(tmp_path):
    register_output_dir_resolvers()
    cfg = OmegaConf.create({"dir": "${unique_dir:" + str(tmp_path / "run") + "}"})
    with unclaimed():
        assert cfg.dir == str(tmp_path / "run")
    assert list(tmp_path.iterdir()) == []
    assert claim_unique_dir(str(tmp_path / "run")) == str(tmp_path / "run")
