"""Joint training as a capability of a method: Medusa-2's hooks (specheads/methods/medusa/joint.py) and the trainer's
and loader's calls of them."""

from mutations import Mutation

MEDUSA2 = "tests/methods/medusa/test_medusa2_trainer.py"
STAGE_ONE = f"{MEDUSA2}::test_stage_one_of_joint_training_steps_bit_for_bit_as_the_heads_alone"

MUTATIONS = (
    Mutation(
        "joint-heads-lr-not-multiplied",
        "Medusa-2's heads learn at train.lr, not train.lr x heads_lr_multiplier",
        "specheads/methods/medusa/joint.py",
        '"lr": lr * self.heads_lr_multiplier},',
        '"lr": lr},',
        (STAGE_ONE,),
    ),
    Mutation(
        "joint-lora-starts-nonzero",
        "the LoRA adapters start with random B: the base's outputs change before they train",
        "specheads/methods/medusa/joint.py",
        '            task_type="CAUSAL_LM",\n',
        '            task_type="CAUSAL_LM",\n            init_lora_weights=False,\n',
        (STAGE_ONE,),
    ),
    Mutation(
        "joint-stage-one-trains-the-base",
        "lora.stage1_steps ignored: the base trains (and its loss counts) from the first step",
        "specheads/methods/medusa/joint.py",
        "        return step >= self.lora.stage1_steps",
        "        return True",
        (STAGE_ONE,),
    ),
    Mutation(
        "joint-original-keeps-the-adapter",
        "the 'original' base keeps its adapter: the held-out loss without it is the fine-tuned one",
        "specheads/methods/medusa/joint.py",
        "        return base.disable_adapter()",
        "        return __import__('contextlib').nullcontext()",
        (f"{MEDUSA2}::test_medusa2_self_distillation_runs_and_reports_the_base_loss",),
    ),
    Mutation(
        "trainer-ignores-joint-param-groups",
        "the trainer builds the heads-only parameter groups under joint training (the adapters never train)",
        "specheads/training/trainer.py",
        "        return joint.param_groups(base, heads, config.train.lr)\n",
        "        pass\n",
        (STAGE_ONE,),
    ),
    Mutation(
        "trainer-skips-joint-save",
        "the trainer exports the heads without what joint training changed of the base",
        "specheads/training/trainer.py",
        "            run.joint.save(accelerator.unwrap_model(run.base), target / ADAPTER_DIR)\n",
        "            pass\n",
        (f"{MEDUSA2}::test_medusa2_lora_exports_an_adapter_that_decoding_merges",),
    ),
    Mutation(
        "decoding-skips-joint-bind",
        "loading Medusa-2 heads for decoding leaves the saved adapter unmerged",
        "specheads/heads/loading.py",
        "        base_model = head_type_of(loaded).bind_joint(adapter, base_model)\n",
        "",
        (f"{MEDUSA2}::test_medusa2_lora_exports_an_adapter_that_decoding_merges",),
    ),
    Mutation(
        "joint-feature-cache-allowed",
        "a feature cache is written and read under joint training, though the base it caches trains",
        "specheads/training/trainer.py",
        '        raise ConfigError(f"data.feature_cache needs a frozen base; {joint.setting} trains it")',
        "        pass",
        (f"{MEDUSA2}::test_joint_training_refuses_a_feature_cache_by_its_setting",),
    ),
)
