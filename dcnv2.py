"""`python dcnv2.py`: NVIDIA's DCNv2 entry point (DLRM_and_DCNv2 tree): main.py with the
defaults the reference's dcnv2.py gives; any flag given on the command line still wins."""
import main

DCNV2_DEFAULTS = {"interaction": "cross", "optimizer": "adam", "learning_rate": 0.0001,
                  "warmup_steps": 100}

if __name__ == "__main__":
    for name, value in DCNV2_DEFAULTS.items():
        main.FLAGS.set_default(name, value)
    main.run()
