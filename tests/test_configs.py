"""Every config file shipped under configs/ loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from specheads.inference.trees import TREES_DIR, available_trees, resolve_tree

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_trees_are_package_data_and_configs_trees_shows_them() -> None:
    assert Path(__file__).resolve().parents[1] / "specheads" / "trees" == TREES_DIR
    assert (CONFIGS / "trees").resolve() == TREES_DIR
    assert available_trees()


@pytest.mark.parametrize("name", available_trees())
def test_every_shipped_tree_resolves(name: str) -> None:
    by_name = resolve_tree(name)
    by_path = resolve_tree(str(TREES_DIR / f"{name}.json"))
    assert by_name.num_nodes == by_path.num_nodes > 0
    assert by_name.choices == by_path.choices


YAMLS = sorted(CONFIGS.rglob("*.yaml")) + sorted(CONFIGS.rglob("*.yml"))
ACCELERATE = CONFIGS / "accelerate"  # accelerate launch configs, not recipes
RECIPES = [path for path in YAMLS if ACCELERATE not in path.parents]
LAUNCH_CONFIGS = [path for path in YAMLS if ACCELERATE in path.parents]


def test_there_are_recipes_and_launch_configs() -> None:
    assert RECIPES
    assert {path.name for path in LAUNCH_CONFIGS} >= {"ddp.yaml", "fsdp.yaml"}
    assert len(RECIPES) + len(LAUNCH_CONFIGS) == len(YAMLS)  # every YAML under configs/ is loaded by a test below


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_recipe_loads_through_the_schema(path: Path) -> None:
    from specheads.training.config import load_config

    config = load_config(path)
    assert config.data.paths
    assert config.output.dir


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_recipe_names_its_method_and_output_directory(path: Path) -> None:
    """A shipped recipe states ``heads.type`` and ``output.dir`` itself: what it trains and where it writes never
    follow the schema's defaults, so that changing a default changes no shipped recipe."""
    import yaml

    recipe = yaml.safe_load(path.read_text())
    assert (recipe.get("heads") or {}).get("type"), f"{path.name}: no heads.type"
    assert (recipe.get("output") or {}).get("dir"), f"{path.name}: no output.dir"


@pytest.mark.parametrize("path", LAUNCH_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_accelerate_config_loads_with_accelerate(path: Path) -> None:
    """accelerate's own loader (what ``accelerate launch --config_file`` runs) rejects unknown keys and bad values."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type in (DistributedType.MULTI_GPU, DistributedType.FSDP)
    assert config.num_processes >= 2 and config.num_machines == 1
    assert config.mixed_precision in ("no", "bf16", "fp16")
    assert not config.use_cpu
    if config.distributed_type == DistributedType.FSDP:
        fsdp = config.fsdp_config
        assert fsdp["fsdp_version"] == 1  # the trainer adjusts FSDP1's plugin per model (see processes.prepare_fsdp)
        assert fsdp["fsdp_use_orig_params"] is True
        assert fsdp["fsdp_cpu_ram_efficient_loading"] is False
        assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
        assert fsdp["fsdp_sharding_strategy"] == "FULL_SHARD"


def test_the_fsdp_config_builds_accelerates_fsdp_plugin(monkeypatch) -> None:
    """The FSDP settings reach accelerate's plugin as ``accelerate launch`` passes them (environment variables)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import ShardingStrategy, StateDictType

    argv = ["--config_file", str(ACCELERATE / "fsdp.yaml"), "--mixed_precision", "no", "train.py"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert args.use_fsdp
    for key, value in prepare_multi_gpu_env(args).items():
        if key.startswith(("FSDP_", "ACCELERATE_USE_FSDP")):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 1 and plugin.use_orig_params
    assert plugin.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
