# The training study's data (flashwatt.training), an input of every training cell.
from flashwatt.training.suite import DATA_MANIFEST, training_section


# Reads the corpus, trains or loads the tokenizer and tokenises both splits (cached by
# corpus and tokenizer): CPU work, done where Snakemake runs, once per suite.
rule training_data:
    output:
        DATA_MANIFEST,
    log:
        "results/logs/{suite}/training_data.log",
    params:
        section=lambda wc: training_section(config, wc.suite),
    localrule: True
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/training_data.py"
