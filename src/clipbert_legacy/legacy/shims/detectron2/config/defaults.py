"""detectron2's default config ``_C``: every key and default of detectron2 at commit ffff8ac (April 2020),
the version ClipBERT's Dockerfile installs, so a config file written for (or dumped by) that detectron2
merges here key for key, and a misspelt key is refused as detectron2 refuses it."""
from .config import CfgNode as CN

__all__ = ["_C"]

_DEFAULTS = {
    "VERSION": 2,
    "MODEL": {
        "LOAD_PROPOSALS": False, "MASK_ON": False, "KEYPOINT_ON": False, "DEVICE": "cuda",
        "META_ARCHITECTURE": "GeneralizedRCNN", "WEIGHTS": "",
        "PIXEL_MEAN": [103.530, 116.280, 123.675], "PIXEL_STD": [1.0, 1.0, 1.0],
        "BACKBONE": {"NAME": "build_resnet_backbone", "FREEZE_AT": 2},
        "FPN": {"IN_FEATURES": [], "OUT_CHANNELS": 256, "NORM": "", "FUSE_TYPE": "sum"},
        "PROPOSAL_GENERATOR": {"NAME": "RPN", "MIN_SIZE": 0},
        "ANCHOR_GENERATOR": {"NAME": "DefaultAnchorGenerator", "SIZES": [[32, 64, 128, 256, 512]],
                             "ASPECT_RATIOS": [[0.5, 1.0, 2.0]], "ANGLES": [[-90, 0, 90]], "OFFSET": 0.0},
        "RPN": {
            "HEAD_NAME": "StandardRPNHead", "IN_FEATURES": ["res4"], "BOUNDARY_THRESH": -1,
            "IOU_THRESHOLDS": [0.3, 0.7], "IOU_LABELS": [0, -1, 1], "BATCH_SIZE_PER_IMAGE": 256,
            "POSITIVE_FRACTION": 0.5, "BBOX_REG_WEIGHTS": (1.0, 1.0, 1.0, 1.0), "SMOOTH_L1_BETA": 0.0,
            "LOSS_WEIGHT": 1.0, "PRE_NMS_TOPK_TRAIN": 12000, "PRE_NMS_TOPK_TEST": 6000,
            "POST_NMS_TOPK_TRAIN": 2000, "POST_NMS_TOPK_TEST": 1000, "NMS_THRESH": 0.7,
        },
        "ROI_HEADS": {
            "NAME": "Res5ROIHeads", "NUM_CLASSES": 80, "IN_FEATURES": ["res4"], "IOU_THRESHOLDS": [0.5],
            "IOU_LABELS": [0, 1], "BATCH_SIZE_PER_IMAGE": 512, "POSITIVE_FRACTION": 0.25,
            "SCORE_THRESH_TEST": 0.05, "NMS_THRESH_TEST": 0.5, "PROPOSAL_APPEND_GT": True,
        },
        "ROI_BOX_HEAD": {
            "NAME": "", "BBOX_REG_WEIGHTS": (10.0, 10.0, 5.0, 5.0), "SMOOTH_L1_BETA": 0.0,
            "POOLER_RESOLUTION": 14,
            "POOLER_SAMPLING_RATIO": 0, "POOLER_TYPE": "ROIAlignV2", "NUM_FC": 0, "FC_DIM": 1024,
            "NUM_CONV": 0, "CONV_DIM": 256, "NORM": "", "CLS_AGNOSTIC_BBOX_REG": False,
            "TRAIN_ON_PRED_BOXES": False,
        },
        "ROI_BOX_CASCADE_HEAD": {
            "BBOX_REG_WEIGHTS": ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0)),
            "IOUS": (0.5, 0.6, 0.7),
        },
        "ROI_MASK_HEAD": {
            "NAME": "MaskRCNNConvUpsampleHead", "POOLER_RESOLUTION": 14, "POOLER_SAMPLING_RATIO": 0,
            "NUM_CONV": 0, "CONV_DIM": 256, "NORM": "", "CLS_AGNOSTIC_MASK": False,
            "POOLER_TYPE": "ROIAlignV2",
        },
        "ROI_KEYPOINT_HEAD": {
            "NAME": "KRCNNConvDeconvUpsampleHead", "POOLER_RESOLUTION": 14, "POOLER_SAMPLING_RATIO": 0,
            "CONV_DIMS": (512,) * 8, "NUM_KEYPOINTS": 17, "MIN_KEYPOINTS_PER_IMAGE": 1,
            "NORMALIZE_LOSS_BY_VISIBLE_KEYPOINTS": True, "LOSS_WEIGHT": 1.0, "POOLER_TYPE": "ROIAlignV2",
        },
        "SEM_SEG_HEAD": {
            "NAME": "SemSegFPNHead", "IN_FEATURES": ["p2", "p3", "p4", "p5"], "IGNORE_VALUE": 255,
            "NUM_CLASSES": 54, "CONVS_DIM": 128, "COMMON_STRIDE": 4, "NORM": "GN", "LOSS_WEIGHT": 1.0,
        },
        "PANOPTIC_FPN": {
            "INSTANCE_LOSS_WEIGHT": 1.0,
            "COMBINE": {"ENABLED": True, "OVERLAP_THRESH": 0.5, "STUFF_AREA_LIMIT": 4096,
                        "INSTANCES_CONFIDENCE_THRESH": 0.5},
        },
        "RETINANET": {
            "NUM_CLASSES": 80, "IN_FEATURES": ["p3", "p4", "p5", "p6", "p7"], "NUM_CONVS": 4,
            "IOU_THRESHOLDS": [0.4, 0.5], "IOU_LABELS": [0, -1, 1], "PRIOR_PROB": 0.01,
            "SCORE_THRESH_TEST": 0.05, "TOPK_CANDIDATES_TEST": 1000, "NMS_THRESH_TEST": 0.5,
            "BBOX_REG_WEIGHTS": (1.0, 1.0, 1.0, 1.0), "FOCAL_LOSS_GAMMA": 2.0, "FOCAL_LOSS_ALPHA": 0.25,
            "SMOOTH_L1_LOSS_BETA": 0.1,
        },
        "RESNETS": {
            "DEPTH": 50, "OUT_FEATURES": ["res4"], "NUM_GROUPS": 1, "NORM": "FrozenBN", "WIDTH_PER_GROUP": 64,
            "STRIDE_IN_1X1": True, "RES5_DILATION": 1, "RES2_OUT_CHANNELS": 256, "STEM_OUT_CHANNELS": 64,
            "DEFORM_ON_PER_STAGE": [False, False, False, False], "DEFORM_MODULATED": False,
            "DEFORM_NUM_GROUPS": 1,
        },
    },
    "INPUT": {
        "MIN_SIZE_TRAIN": (800,), "MIN_SIZE_TRAIN_SAMPLING": "choice", "MAX_SIZE_TRAIN": 1333,
        "MIN_SIZE_TEST": 800, "MAX_SIZE_TEST": 1333,
        "CROP": {"ENABLED": False, "TYPE": "relative_range", "SIZE": [0.9, 0.9]},
        "FORMAT": "BGR", "MASK_FORMAT": "polygon",
    },
    "DATASETS": {
        "TRAIN": (), "PROPOSAL_FILES_TRAIN": (), "PRECOMPUTED_PROPOSAL_TOPK_TRAIN": 2000, "TEST": (),
        "PROPOSAL_FILES_TEST": (), "PRECOMPUTED_PROPOSAL_TOPK_TEST": 1000,
    },
    "DATALOADER": {
        "NUM_WORKERS": 4, "ASPECT_RATIO_GROUPING": True, "SAMPLER_TRAIN": "TrainingSampler",
        "REPEAT_THRESHOLD": 0.0, "FILTER_EMPTY_ANNOTATIONS": True,
    },
    "SOLVER": {
        "LR_SCHEDULER_NAME": "WarmupMultiStepLR", "MAX_ITER": 40000, "BASE_LR": 0.001, "MOMENTUM": 0.9,
        "WEIGHT_DECAY": 0.0001, "WEIGHT_DECAY_NORM": 0.0, "GAMMA": 0.1, "STEPS": (30000,),
        "WARMUP_FACTOR": 1.0 / 1000, "WARMUP_ITERS": 1000, "WARMUP_METHOD": "linear",
        "CHECKPOINT_PERIOD": 5000, "IMS_PER_BATCH": 16, "BIAS_LR_FACTOR": 1.0, "WEIGHT_DECAY_BIAS": 0.0001,
        "CLIP_GRADIENTS": {"ENABLED": False, "CLIP_TYPE": "value", "CLIP_VALUE": 1.0, "NORM_TYPE": 2.0},
    },
    "TEST": {
        "EXPECTED_RESULTS": [], "EVAL_PERIOD": 0, "KEYPOINT_OKS_SIGMAS": [], "DETECTIONS_PER_IMAGE": 100,
        "AUG": {"ENABLED": False, "MIN_SIZES": (400, 500, 600, 700, 800, 900, 1000, 1100, 1200),
                "MAX_SIZE": 4000, "FLIP": True},
        "PRECISE_BN": {"ENABLED": False, "NUM_ITER": 200},
    },
    "OUTPUT_DIR": "./output",
    "SEED": -1,
    "CUDNN_BENCHMARK": False,
    "VIS_PERIOD": 0,
    "GLOBAL": {"HACK": 1.0},
}

_C = CN(_DEFAULTS)
