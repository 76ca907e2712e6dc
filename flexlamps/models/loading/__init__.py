"""Reading models: built-in names, Hugging Face folders, GGUF files, tokenizers and the packed-weight cache."""
