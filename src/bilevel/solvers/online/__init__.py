"""Online (streaming) bilevel solvers: the round contract (``base``), the window of past
rounds (``window``), F2OBO, F2OBO-SL, AF2OBO, SF2OBO and the baselines OBBO, SOBBO, SOBOW,
OAGD, AOBO, FSOBO and SOGD."""
