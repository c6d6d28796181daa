#include "specllm/boundary.h"

namespace specllm {

bool ends_sentence(const std::string & piece) {
    size_t n = piece.size();
    while (n > 0 && piece[n - 1] == ' ') {
        --n;
    }
    return n > 0 && (piece[n - 1] == '.' || piece[n - 1] == '!' || piece[n - 1] == '?');
}

bool starts_with_space(const std::string & piece) {
    return !piece.empty() && (piece[0] == ' ' || piece[0] == '\n' || piece[0] == '\t' || piece[0] == '\r');
}

int sentence_boundary(const Model & model, llama_token last, const llama_token * draft, int n) {
    bool after_end = last >= 0 && ends_sentence(model.piece(last));
    for (int j = 0; j < n; ++j) {
        const std::string piece = model.piece(draft[j]);
        if (after_end && starts_with_space(piece)) {
            return j;
        }
        if (model.is_eog(draft[j]) || (j + 1 < n && model.is_eog(draft[j + 1]))) {
            return j; // a copied message's last token, or its end of turn
        }
        after_end = ends_sentence(piece);
    }
    return -1;
}

int cut_after_end(const Model & model, std::vector<llama_token> & draft) {
    for (size_t j = 0; j < draft.size(); ++j) {
        if (model.is_eog(draft[j])) {
            draft.resize(j + 1);
            break;
        }
    }
    return (int) draft.size();
}

} // namespace specllm
