"""Named budgets: `cramming-day` is the compute of Cramming's 24 hours on an RTX A6000."""

from __future__ import annotations

from pathlib import Path

import pytest

from search import confirm, run
from trainer import cram
from trainer.budget import Budget, BudgetError

# trainer/budget.py: 24 h x 154.8e12 FLOP/s (the A6000's dense tensor peak) x 0.40 utilisation.
CRAMMING_DAY_FLOPS = 86_400 * 154.8e12 * 0.40


@pytest.mark.parametrize("text", ["cramming-day", " Cramming-Day "])
def test_cramming_day_parses_to_the_flops_of_the_papers_day(text):
    budget = Budget.parse(text)
    assert (budget.kind, budget.text) == ("flops", "cramming-day")
    assert budget.amount == pytest.approx(CRAMMING_DAY_FLOPS) and budget.amount == pytest.approx(5.35e18, rel=1e-3)
    assert Budget.parse(budget.text) == budget  # a result or checkpoint records it by its name


def test_cramming_day_is_about_nine_billion_crammed_bert_tokens():
    # The cross-check of trainer/budget.py: under the 600,000 micro-batches of 128 x 128 tokens the
    # paper's recipe caps its steps at.
    from trainer.config import load_run_config

    arch = load_run_config(Path(__file__).resolve().parents[1] / "trainer/configs/crammed-bert.yaml").arch
    tokens = Budget.parse("cramming-day").tokens_left(0, arch.flops_per_token())
    assert 8e9 < tokens < 600_000 * 128 * 128


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(BudgetError, match=r"cannot read 'cramming-week'.*cramming-day"):
        Budget.parse("cramming-week")


@pytest.mark.parametrize("main", [cram.main, run.main, confirm.main], ids=["trainer.cram", "search.run", "search.confirm"])
def test_the_budget_help_names_cramming_day(main, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "cramming-day" in " ".join(capsys.readouterr().out.split())
