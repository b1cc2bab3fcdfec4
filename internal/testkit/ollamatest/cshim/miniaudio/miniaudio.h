/*
 * Stand-in for miniaudio.h, used only to build the Ollama server from the Go
 * module proxy for vramguard's integration tests.
 *
 * Go module zips drop vendor/ folders, so llama.cpp's vendored miniaudio is
 * missing when `go install github.com/ollama/ollama@v0.17.4` compiles
 * tools/mtmd/mtmd-helper.cpp. That file uses only the decoder API declared
 * here. Every function reports failure, so audio input is off; text
 * generation is unaffected.
 */
#ifndef VRAMGUARD_MINIAUDIO_SHIM_H
#define VRAMGUARD_MINIAUDIO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint32_t ma_uint32;
typedef uint64_t ma_uint64;

typedef enum {
    MA_SUCCESS = 0,
    MA_ERROR = -1,
    MA_NOT_IMPLEMENTED = -29
} ma_result;

typedef enum {
    ma_format_unknown = 0,
    ma_format_u8 = 1,
    ma_format_s16 = 2,
    ma_format_s24 = 3,
    ma_format_s32 = 4,
    ma_format_f32 = 5,
    ma_format_count
} ma_format;

typedef struct {
    ma_format format;
    ma_uint32 channels;
    ma_uint32 sampleRate;
} ma_decoder_config;

typedef struct {
    ma_decoder_config config;
} ma_decoder;

static inline ma_decoder_config ma_decoder_config_init(ma_format outputFormat, ma_uint32 outputChannels, ma_uint32 outputSampleRate)
{
    ma_decoder_config config;
    config.format = outputFormat;
    config.channels = outputChannels;
    config.sampleRate = outputSampleRate;
    return config;
}

static inline ma_result ma_decoder_init_memory(const void* pData, size_t dataSize, const ma_decoder_config* pConfig, ma_decoder* pDecoder)
{
    (void)pData;
    (void)dataSize;
    if (pDecoder != NULL && pConfig != NULL) {
        pDecoder->config = *pConfig;
    }
    return MA_NOT_IMPLEMENTED;
}

static inline ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder* pDecoder, ma_uint64* pLength)
{
    (void)pDecoder;
    if (pLength != NULL) {
        *pLength = 0;
    }
    return MA_NOT_IMPLEMENTED;
}

static inline ma_result ma_decoder_read_pcm_frames(ma_decoder* pDecoder, void* pFramesOut, ma_uint64 frameCount, ma_uint64* pFramesRead)
{
    (void)pDecoder;
    (void)pFramesOut;
    (void)frameCount;
    if (pFramesRead != NULL) {
        *pFramesRead = 0;
    }
    return MA_NOT_IMPLEMENTED;
}

static inline ma_result ma_decoder_uninit(ma_decoder* pDecoder)
{
    (void)pDecoder;
    return MA_SUCCESS;
}

#ifdef __cplusplus
}
#endif

#endif /* VRAMGUARD_MINIAUDIO_SHIM_H */
