"""Hugging Face interop, both directions.

* ``export.export_checkpoint``: a sameloss checkpoint → a folder that
  ``AutoModelForMaskedLM`` / ``AutoTokenizer`` load without sameloss (``sameloss export``);
* ``bert.to_hf_bert``: a post-LN ``TransformerMLM`` as a ``BertForMaskedLM`` with the same
  logits (the export's model, and the reference our transformer is tested against);
* ``adapter.load_hf_folder``: any Hugging Face masked-LM folder → a module mapping sameloss
  token ids to logits over a language's (or a prepared corpus's) vocabulary, which every
  measure accepts
  (``sameloss measure HF_FOLDER``).

``transformers`` and ``tokenizers`` are imported only when these are used.
"""
