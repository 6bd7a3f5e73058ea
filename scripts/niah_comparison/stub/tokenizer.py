# Stub for RULER scripts/data/tokenizer.py: whitespace words are tokens.
# (The real module imports tenacity and NeMo/HF/tiktoken backends; not needed here.)
class WhitespaceTokenizer:
    def text_to_tokens(self, text):
        return text.split()
    def tokens_to_text(self, tokens):
        return " ".join(tokens)

def select_tokenizer(tokenizer_type, tokenizer_path):
    return WhitespaceTokenizer()
