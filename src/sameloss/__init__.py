"""sameloss: same pre-training loss, different downstream — measure why.

A toolkit around Liu, Xie, Li & Ma (ICML 2023): languages with exact masked-token
conditionals, MLM pre-training, flatness measures and downstream evaluation.
"""

__version__ = "0.1.0"
