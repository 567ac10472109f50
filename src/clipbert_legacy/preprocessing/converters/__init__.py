"""Converters from the public raw annotation releases to the files the shipped configs read.

    python -m clipbert_legacy.preprocessing.converters msrvtt_ret \
        --videodata train_val_videodatainfo.json test_videodatainfo.json \
        --test_csv MSRVTT_JSFUSION_test.csv [--train_list MSRVTT_train.7k.csv] \
        --output_dir /txt/msrvtt_retrieval
    python -m clipbert_legacy.preprocessing.converters msrvtt_mc --mc_csv MSR_MC_test.csv \
        --output_dir /txt/downstream/msrvtt_retrieval_mc
    python -m clipbert_legacy.preprocessing.converters msrvtt_qa --raw_dir MSRVTT-QA/ \
        --output_dir /txt/msrvtt_qa
    python -m clipbert_legacy.preprocessing.converters tgif_qa --raw_dir tgif-qa/dataset/ \
        --output_dir /txt/tgif_qa
    python -m clipbert_legacy.preprocessing.converters didemo_ret --raw_dir LocalizingMoments/data \
        --output_dir /txt/didemo_retrieval
    python -m clipbert_legacy.preprocessing.converters anet_ret --raw_dir captions/ \
        --output_dir /txt/anet_retrieval
    python -m clipbert_legacy.preprocessing.converters vqa --raw_dir VQA2/ \
        --karpathy_split dataset_coco.json --output_dir /txt/vqa
    python -m clipbert_legacy.preprocessing.converters vg_qa --question_answers question_answers.json \
        --image_data image_data.json --coco_annotations captions_train2014.json captions_val2014.json \
        --karpathy_split dataset_coco.json --ans2label /txt/vqa/trainval_ans2label.json --output_dir /txt/vqa
    python -m clipbert_legacy.preprocessing.converters coco_captions \
        --captions_train captions_train2014.json --captions_val captions_val2014.json \
        --karpathy_split dataset_coco.json --output_dir /txt/pretrain
    python -m clipbert_legacy.preprocessing.converters vg_captions \
        --region_descriptions region_descriptions.json --image_data image_data.json \
        --coco_annotations captions_train2014.json captions_val2014.json \
        --karpathy_split dataset_coco.json --output_dir /txt/pretrain

One module per dataset (msrvtt, msrvtt_qa, tgif_qa, vqa, coco, visual_genome; paragraphs: DiDeMo and
ActivityNet Captions); common holds the readers that name the file and row of every bad entry and the
all-or-nothing writer. Output names are the ones ClipBERT's configs read.
"""
