"""Wrapper: run RULER's unmodified niah.py with the whitespace tokenizer stub.
Usage: python run_niah.py <niah.py args...>"""
import os, sys, runpy
HERE = os.path.dirname(os.path.abspath(__file__))
NIAH = os.path.join(HERE, "src/scripts/data/synthetic/niah.py")
# stub dir first so `from tokenizer import select_tokenizer` gets the stub;
# synthetic dir next (what sys.path[0] would be when run as a script) for constants.py
sys.path[:0] = [os.path.join(HERE, "stub"), os.path.dirname(NIAH)]
sys.argv = [NIAH] + sys.argv[1:]
runpy.run_path(NIAH, run_name="__main__")
