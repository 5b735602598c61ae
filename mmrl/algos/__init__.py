"""RL algorithms as pure functions: advantage estimators, policy losses, KL estimators.

To add an advantage estimator, write a function with the signature of
:func:`mmrl.algos.advantages.grpo_advantages` and add it to ``ESTIMATORS`` in that module; the config's
``algorithm.adv_estimator`` then accepts its name.
"""
