"""`python dlrm.py`: NVIDIA's DLRM entry point (DLRM_and_DCNv2 tree). DLRM's defaults are
main.py's, so this is main.py under the reference's name."""
import main

if __name__ == "__main__":
    main.run()
