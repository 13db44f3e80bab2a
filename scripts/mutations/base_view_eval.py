"""One view of the base for held-out evaluation: every method's evaluation reads the base through a ``BaseView`` of
the batch (one forward, no whole ``[B, T, V]`` logits), whose final state, teacher and greedy tokens are the
forward's own, online and from the feature cache; and every shipped recipe names its method and output directory,
so that the schema's defaults decide nothing it trains."""

from mutations import Mutation

HELD_OUT = (
    "tests/methods/test_held_out_base.py::test_a_methods_evaluation_runs_the_base_once_a_batch_without_its_whole_logits"
)
VIEW = "tests/training/test_features.py::test_the_view_of_a_batch_reads_as_the_forward_online_and_from_the_cache"

MUTATIONS = (
    Mutation(
        "medusa-evaluation-whole-logits",
        "Medusa's held-out evaluation has the base's forward build its whole [B, T, V] logits",
        "specheads/methods/medusa/evaluate.py",
        "        view = BaseView.of(base, batch, full_logits=False)\n",
        "        view = BaseView.of(base, batch)\n",
        (f"{HELD_OUT}[medusa]",),
    ),
    Mutation(
        "dflash-evaluation-whole-logits",
        "DFlash's held-out evaluation has the base's forward build its whole [B, T, V] logits",
        "specheads/methods/dflash/train.py",
        "        view = BaseView.of(base, batch, full_logits=False)\n",
        "        view = BaseView.of(base, batch)\n",
        (f"{HELD_OUT}[dflash]",),
    ),
    Mutation(
        "view-final-is-a-layer-below",
        "the view's final state is the hidden state of the layer below it",
        "specheads/training/features.py",
        "        return self.hidden(len(self.output.hidden_states) - 1)\n",
        "        return self.hidden(len(self.output.hidden_states) - 2)\n",
        (VIEW,),
    ),
    Mutation(
        "view-teacher-skips-the-logit-transform",
        "the view's teacher projects the final state through the lm_head alone, whatever the base's logit transform",
        "specheads/training/features.py",
        "        return teacher_logits(self.base, self.output, columns)\n",
        "        head = self.base.get_output_embeddings()\n"
        "        logits = head(self.final.to(head.weight.dtype))\n"
        "        return logits if columns is None else logits[..., columns]\n",
        (VIEW,),
    ),
    Mutation(
        "recipe-follows-the-default-method",
        "a shipped recipe leaves heads.type to the schema's default: a changed default would change what it trains",
        "configs/default/medusa1.yaml",
        "heads:\n  type: medusa\n",
        "heads:\n",
        ("tests/test_configs.py::test_every_recipe_names_its_method_and_output_directory",),
    ),
)
