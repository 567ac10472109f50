"""Converters from the public raw annotation releases to this project's jsonl + ans2label.json.

    python -m src.preprocessing.converters msrvtt_ret --videodata train_val_videodata.json \
        test_videodata.json --test_csv MSRVTT_JSFUSION_test.csv [--train_list MSRVTT_train.7k.csv] \
        [--mc_csv MSR_MC_test.csv] --output_dir /txt/msrvtt_retrieval
    python -m src.preprocessing.converters msrvtt_qa --raw_dir MSRVTT-QA/ --output_dir /txt/msrvtt_qa
    python -m src.preprocessing.converters tgif_qa --raw_dir tgif-qa/dataset/ --output_dir /txt/tgif_qa
    python -m src.preprocessing.converters didemo_ret --raw_dir LocalizingMoments/data \
        --output_dir /txt/didemo_retrieval
    python -m src.preprocessing.converters anet_ret --raw_dir captions/ --output_dir /txt/anet_retrieval
    python -m src.preprocessing.converters vqa --raw_dir VQA2/ --vocab_splits train val --output_dir /txt/vqa

One module per dataset (msrvtt, msrvtt_qa, tgif_qa, vqa; paragraphs: DiDeMo and ActivityNet Captions);
common holds the readers that make every bad row a one-line `file:line` ValueError.
"""
