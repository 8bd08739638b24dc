"""MoRSE experiments: from a config to a trained and evaluated system (`experiment` builds the
parts, `pipeline` trains, evaluates, plans and runs the demo), evaluation summaries and records,
plots, the Table 2 study, and the null programs every task family must give no reward.
"""
